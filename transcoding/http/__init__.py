"""HTTP plumbing shared by every route: the uvicorn server, access and size limits, bodies,
JSON, error statuses, route metrics and the timing headers."""
