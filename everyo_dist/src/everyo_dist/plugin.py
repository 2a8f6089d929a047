"""Entry point of the everyo-dist plugin: its hookimpls register what it provides."""
