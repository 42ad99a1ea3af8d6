# Shortcuts for the two set-up commands in the README (make is optional).
.PHONY: demo test
demo:
	python3 dev.py demo
test:
	python3 dev.py test
