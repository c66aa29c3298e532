"""pytest plugin of the conformance kit: inert unless a store URL is configured."""
