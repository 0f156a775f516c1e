"""The ``kembed`` command: one module per subcommand under :mod:`kembed_cli.commands`."""
