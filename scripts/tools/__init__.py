"""Tools around the project: measure_profile (fit a compute-clock device profile), page_screenshots
(the README's page screenshots), webdriver (a minimal chromedriver client, also used by the tests)."""
