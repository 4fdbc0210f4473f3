"""deltarl's shipped data (no code): the agent zoo, presets, scenario texts, the papers' numbers,
campaign files and grids. Installed with the package; found through :mod:`workers.resources`."""
