"""How fast and how robust the request path is: load, alternated comparisons, hostile clients, peers."""
