"""flows layer of RhymeRL."""
