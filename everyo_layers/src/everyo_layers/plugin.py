"""Entry point of the everyo-layers plugin: its hookimpls register what it provides."""
