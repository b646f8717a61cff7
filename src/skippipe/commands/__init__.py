"""Sub-commands of the skippipe CLI, one module each."""
