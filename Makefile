# Shortcuts for the two commands in the README.
.PHONY: run test
run:
	scripts/run.sh
test:
	scripts/test.sh
