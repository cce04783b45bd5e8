package idemfiber_test

import (
	"fmt"
	"io"
	"net/http/httptest"
	"strings"

	"github.com/gofiber/fiber/v2"

	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/idemfiber"
	"github.com/onceguard/onceguard/idempotency/memstore"
)

// A retry with the same key gets the first answer, byte for byte, and the
// handler runs once.
func ExampleNew() {
	app := fiber.New()
	app.Use(idemfiber.New(idempotency.Options[*fiber.Ctx]{Store: &memstore.Store{}}))
	runs := 0
	app.Post("/payments", func(c *fiber.Ctx) error {
		runs++
		return c.Status(fiber.StatusCreated).JSON(fiber.Map{"payment_id": fmt.Sprint("p", runs)})
	})

	for range 2 {
		req := httptest.NewRequest("POST", "/payments", strings.NewReader(`{"amount":"10.00"}`))
		req.Header.Set("Idempotency-Key", "8e03978e-40d5-43e8-bc93-6894a57f9324")
		resp, err := app.Test(req)
		if err != nil {
			panic(err)
		}
		body, _ := io.ReadAll(resp.Body)
		fmt.Println(resp.StatusCode, string(body), "replayed="+resp.Header.Get("Idempotent-Replayed"))
	}
	fmt.Println("handler runs:", runs)
	// Output:
	// 201 {"payment_id":"p1"} replayed=
	// 201 {"payment_id":"p1"} replayed=true
	// handler runs: 1
}
