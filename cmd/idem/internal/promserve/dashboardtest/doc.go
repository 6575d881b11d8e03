// Package dashboardtest checks the Grafana dashboard in docs/grafana
// against the metrics the idem command really serves: every PromQL
// expression in it must parse, and every metric and label it names must be
// one the command's /metrics page shows once each of idem's instruments has
// recorded a value. It is a module of its own so that users of the idem
// command never download the PromQL parser.
package dashboardtest
