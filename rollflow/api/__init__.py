"""rollflow's contracts: config, workflow, inference protocol and errors. Imports nothing heavy."""
