"""One module per titan-train command."""
