"""Several sidecars on one PostgreSQL database (DECISIONS.md "Scale beyond one
machine"): per-lane leases with fencing (leases.py, jobs.py), calls for a lane
forwarded to the node that holds it (forward.py). Above turns/ and store/,
below api/; runtime.py wires it only for the postgres backend."""
