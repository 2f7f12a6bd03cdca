"""tasks layer of RhymeRL."""
