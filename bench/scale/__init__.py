"""Beyond the defaults: big logs, many users and items, a GPU."""
