"""The HTTP API (aiohttp server). Every node serves every route."""
