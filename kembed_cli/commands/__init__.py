"""One module per ``kembed`` subcommand, each imported only when its subcommand runs."""
