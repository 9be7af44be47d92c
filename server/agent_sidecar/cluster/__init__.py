"""Several sidecars on one PostgreSQL database (DECISIONS.md "Scale beyond one
machine"): above turns/ and store/, below api/; wired in runtime.py only when
the store is shared."""
