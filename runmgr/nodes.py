"""How runmgr names a Ray node to people and in its records (incidents, exclusions,
plans): the start of its id, unique in a cluster; IPs are not when nodes share a
host, and host names change with every pod."""

from __future__ import annotations

NODE_NAME_CHARS = 12
"""Characters of a Ray node's hex id that name it."""


def node_name(node_id: str) -> str:
    """The name of the Ray node ``node_id``."""
    return node_id[:NODE_NAME_CHARS]
