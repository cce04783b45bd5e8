package memstore_test

import (
	"context"
	"fmt"

	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/memstore"
)

// A queue consumer that may see a message twice runs its work once per
// message id: the second delivery gets the first one's result. The zero
// Store is ready to use; it keeps records in this process only.
func Example() {
	ctx := context.Background()
	var store memstore.Store
	scope := idempotency.Scope{Principal: "billing", Method: "consume", Path: "invoices"}
	charges := 0
	charge := func(context.Context) ([]byte, error) {
		charges++
		return []byte(`{"invoice":"inv_1","charged":"12.00"}`), nil
	}
	for range 2 { // the same message, delivered twice
		result, replayed, err := idempotency.Do(ctx, &store, scope, "msg-42", "sha256-of-the-message", nil, charge)
		fmt.Println(string(result), replayed, err)
	}
	fmt.Println("charges:", charges)
	// Output:
	// {"invoice":"inv_1","charged":"12.00"} false <nil>
	// {"invoice":"inv_1","charged":"12.00"} true <nil>
	// charges: 1
}
