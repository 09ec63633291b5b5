"""The fixtures' JSON layout, shared by the scripts that write `fixture.json`."""

import json


def dumps(obj, indent=0):
    """JSON with dicts and lists of containers indented, lists of scalars on one line."""
    pad, inner = " " * indent, " " * (indent + 1)
    if isinstance(obj, dict):
        if not obj:
            return "{}"
        items = [f"{inner}{json.dumps(k)}: {dumps(v, indent + 1)}" for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    flat = json.dumps(obj, separators=(",", ":"))
    if isinstance(obj, list) and any(isinstance(v, (dict, list)) for v in obj) and len(flat) > 100:
        return "[\n" + ",\n".join(inner + dumps(v, indent + 1) for v in obj) + "\n" + pad + "]"
    return flat
