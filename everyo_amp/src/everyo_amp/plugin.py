"""Entry point of the everyo-amp plugin: its hookimpls register what it provides."""
