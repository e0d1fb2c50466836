"""World models built from real training responses: references (lookup, edit, ...), memory,
the ranker, choice."""
