"""storage layer of RhymeRL."""
