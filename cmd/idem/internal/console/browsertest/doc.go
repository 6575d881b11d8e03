// Package browsertest drives the idem console in a real browser: headless
// Chromium (Debian's chromium package) through chromedp, against a real
// PostgreSQL. It is a module of its own so that users of the idem command
// never download chromedp.
package browsertest
