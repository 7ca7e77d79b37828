"""Entry point: load the settings and start the catalogue server."""
from src import server
from src.config import load_settings

DEFAULT_PORT = 8080
DEBUG_MODE = False


def main():
    settings = load_settings("settings.cfg")
    port = settings.get("port", DEFAULT_PORT)
    server.serve(port, debug=DEBUG_MODE)


if __name__ == "__main__":
    main()
