"""The PostgreSQL backend: several sidecars on one database (docs/cluster.md)."""
