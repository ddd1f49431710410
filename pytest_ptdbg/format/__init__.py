"""The on-disk vocabulary: record names and lines, dump paths, the completeness manifest.

No torch here: every stage may import it, the compare path included."""
