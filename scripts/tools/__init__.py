"""Tools around the project: measure_profile (fit a compute-clock device profile), page_screenshots
(the screenshots in docs/operating.md "The page" and "The testnet page"), webdriver (a minimal
chromedriver client, also used by the tests)."""
