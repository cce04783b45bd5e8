package sqlstore

// The statements the pending indexes serve, for the tests of their plans.
var (
	PendingQuery      = pendingQuery
	PendingCountQuery = pendingCountQuery
)
