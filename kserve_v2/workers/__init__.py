"""``--workers N``: the supervisor of N replica processes behind the same ports, the link
between them, and the service of one replica that answers as one server."""
