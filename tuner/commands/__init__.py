"""One module per `tuner` subcommand: `add_parser(subparsers)` and `run(args, ctx) -> int`."""
