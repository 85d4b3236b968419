"""Replication: the pysyncobj adapter (the only importer of pysyncobj)."""
