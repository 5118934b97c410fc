"""What every job shares: GPU data sheets, byte units, strategy colours, the test hooks and the
lazy public names of the job packages."""
