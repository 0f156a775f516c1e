"""Project scripts: developer and CI helpers that are not part of the shipped packages."""
