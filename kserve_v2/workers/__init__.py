"""``--workers N``: N replica processes behind the same ports, answering as one server.

- ``supervisor``: ``Supervisor``: holds the ports, forks the replicas, runs control calls on every one, replays them.
- ``replicas``: the link between the supervisor and each replica, and what travels over it.
- ``replicated``: the service and extensions of one replica, answering as one server.
- ``replica_views``: statistics, repository index, Prometheus families and status merged from every replica's.
"""
