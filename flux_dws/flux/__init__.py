"""The only code that talks to Flux: the protocol with the dws jobtap plugin."""
