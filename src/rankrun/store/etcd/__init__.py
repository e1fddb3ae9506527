"""The store seam on etcd v3: ``gateway`` (HTTP/1.1 over etcd's JSON gateway, endpoint failover) and ``store``.

Imported only when a job uses ``--rdzv-backend etcd``: a job on the embedded store never loads it.
"""
