"""The web console in a real browser: Debian's chromium driven by Playwright for Python."""
