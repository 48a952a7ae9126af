"""A module that fails to import: what a worker told to preload it must report, not hide."""

raise RuntimeError("this module refuses to be imported")
