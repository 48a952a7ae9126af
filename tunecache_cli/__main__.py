from tunecache_cli import entry

entry()
