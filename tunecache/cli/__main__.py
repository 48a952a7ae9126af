from tunecache.cli import entry

entry()
