"""Examples of your own Dagster assets beside Wire's (README: "Using a window in your own asset").
Not loaded unless named: `WIRE_USER_ASSETS=examples.clicks_assets wire dev`."""
