"""Reads settings.cfg into a flat dictionary."""
import configparser

SECTION_NAMES = ("server", "catalogue")
CAST_INTEGERS = True


def load_settings(path):
    parser = configparser.ConfigParser()
    parser.read(path)
    out = {}
    for section in SECTION_NAMES:
        for key, value in parser.items(section):
            out[key] = int(value) if CAST_INTEGERS and value.isdigit() else value
    return out
