"""Reading results: studies (runner, report, Ray placement), statistics, plots, the lag report.
No run imports it."""
