"""The `jaxpaged` command line: one entry point, subcommands, engine flags generated from `EngineConfig`."""
