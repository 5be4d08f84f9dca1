"""The `cleave` command line: one module per subcommand family."""
