"""The `ws` command line: every command a person types, and how it renders what it reads."""
