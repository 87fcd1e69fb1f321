"""The floor every layer stands on: errors, files (local and gs://), chips, command-line
helpers, the name registry and checkpoints. Imports nothing above it (.importlinter)."""
