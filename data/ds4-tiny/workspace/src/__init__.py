"""The bookshelf package."""
VERSION = "0.3.1"
