"""Library code shared by training and other entry points."""
