package token_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/onceguard/onceguard/idempotency/memstore"
	"github.com/onceguard/onceguard/token"
)

// A form's one-time submit token: issued to a user for a purpose, used
// once, and refused to anyone else. Middleware does the Consume step for
// you when a request sends the token as its Idempotency-Key.
func Example() {
	ctx := context.Background()
	tokens := token.New(&memstore.Store{}, nil) // 5-minute tokens
	issued, _ := tokens.Issue(ctx, "alice", "withdrawal")
	fmt.Println(token.IsToken(issued.Token))

	// Bob cannot use Alice's token, and cannot burn it either.
	_, err := tokens.Consume(ctx, issued.Token, "bob", "withdrawal", "POST /withdrawals")
	fmt.Println(errors.Is(err, token.ErrInvalid))

	fresh, err := tokens.Consume(ctx, issued.Token, "alice", "withdrawal", "POST /withdrawals")
	fmt.Println(fresh, err)
	// The same request again (a retry) names the same use: not fresh.
	fresh, err = tokens.Consume(ctx, issued.Token, "alice", "withdrawal", "POST /withdrawals")
	fmt.Println(fresh, err)
	// Anywhere else it is used up.
	_, err = tokens.Consume(ctx, issued.Token, "alice", "withdrawal", "POST /orders")
	fmt.Println(errors.Is(err, token.ErrUsed))
	// Output:
	// true
	// true
	// true <nil>
	// false <nil>
	// true
}
