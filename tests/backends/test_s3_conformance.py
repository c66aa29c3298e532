"""The conformance kit, every group, against the session's S3 (moto over HTTP, or a real S3/MinIO).

The backdoor damages a value below the SPI: it downloads the object, swaps the
value inside the object's framing (header, ids, seq and metadata kept as they
were) and uploads it with a plain ``PutObject``, so the kit proves the codec's
checks catch damage that S3 hands back. Damage to the framing itself (a
truncated or foreign object) is covered in ``test_s3.py``.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from checkpoint_stores import StorageBackend
from checkpoint_stores.backends import s3 as s3_module
from checkpoint_stores.backends.s3 import S3Backend
from tests.kit_support import ServerConformance


@pytest.mark.s3
class TestS3Conformance(ServerConformance):
    server_fixture = "s3_server"

    async def backdoor_corrupt(
        self,
        backend: StorageBackend,
        thread_id: str,
        key: str,
        mutate: Callable[[bytes], bytes],
    ) -> None:
        assert isinstance(backend, S3Backend)
        name = backend._object(thread_id, key)
        client = backend._client
        try:
            response = await client.get_object(Bucket=backend.bucket, Key=name)
        except client.exceptions.NoSuchKey:
            raise LookupError(f"backdoor_corrupt: nothing stored under {key!r}") from None
        async with response["Body"] as stream:
            body = await stream.read()
        record = s3_module._unframe(body, name)
        damaged = s3_module._frame(
            record.thread_id, record.key, mutate(record.value), record.seq, record.write_id
        )
        await client.put_object(
            Bucket=backend.bucket, Key=name, Body=damaged, Metadata=response.get("Metadata", {})
        )
