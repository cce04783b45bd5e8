<?php
// The seeds' PHP withdrawal endpoint (a webman controller there), as a
// router script for PHP's built-in server, holding balances in its own
// SQLite database. As written there, it takes the user from the session
// cookie, reads the balance, checks it, calls the payout provider, writes
// the balance back and records the withdrawal, all in separate statements;
// its Redis lock and its withdraw_token check are left out here: in front
// of it, `onceguard gateway` is what keeps one intent one debit.
//
//   php withdraw.php setup DB      create the tables and two users
//   BANK_DB=DB PHP_CLI_SERVER_WORKERS=4 php -S 127.0.0.1:PORT withdraw.php
//
// POST /login (user=alice)   a session: sets PHPSESSID
// POST /withdraw (amount=CENTS[&withdraw_token=...])  201, 422 insufficient_funds, 401
// GET  /state                the user's balance, withdrawals, and requests seen by key
// The header X-Test-Delay-Ms sets how long the payout call takes (default 100).
declare(strict_types=1);

function db(string $path): PDO {
    $db = new PDO('sqlite:' . $path);
    $db->setAttribute(PDO::ATTR_ERRMODE, PDO::ERRMODE_EXCEPTION);
    $db->exec('PRAGMA busy_timeout = 30000');
    return $db;
}

function out(int $status, array $v): void {
    http_response_code($status);
    header('Content-Type: application/json');
    echo json_encode($v);
}

if (PHP_SAPI === 'cli') {
    if (($argv[1] ?? '') !== 'setup' || !isset($argv[2])) {
        fwrite(STDERR, "usage: php withdraw.php setup DB\n");
        exit(2);
    }
    $db = db($argv[2]);
    $db->exec('PRAGMA journal_mode = WAL');
    $db->exec('CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT UNIQUE NOT NULL, balance INTEGER NOT NULL)');
    $db->exec('CREATE TABLE sessions (sid TEXT PRIMARY KEY, user_id INTEGER NOT NULL)');
    $db->exec('CREATE TABLE withdrawals (id INTEGER PRIMARY KEY AUTOINCREMENT, user_id INTEGER NOT NULL, amount INTEGER NOT NULL, token TEXT)');
    $db->exec('CREATE TABLE seen (id INTEGER PRIMARY KEY AUTOINCREMENT, user_id INTEGER NOT NULL, token TEXT)');
    $db->exec("INSERT INTO users (name, balance) VALUES ('alice', 1000000), ('bob', 1000000)");
    exit(0);
}

ignore_user_abort(true); // a client gone does not stop a payout half way
$db = db(getenv('BANK_DB'));
$path = parse_url($_SERVER['REQUEST_URI'], PHP_URL_PATH);
$method = $_SERVER['REQUEST_METHOD'];

function user(PDO $db): int {
    $sid = $_COOKIE['PHPSESSID'] ?? '';
    $q = $db->prepare('SELECT user_id FROM sessions WHERE sid = ?');
    $q->execute([$sid]);
    $uid = $q->fetchColumn();
    $q->closeCursor(); // an open cursor holds a read transaction: a later write would fail busy
    return $uid === false ? 0 : (int)$uid;
}

if ($path === '/login' && $method === 'POST') {
    $q = $db->prepare('SELECT id FROM users WHERE name = ?');
    $q->execute([$_POST['user'] ?? '']);
    $uid = $q->fetchColumn();
    $q->closeCursor();
    if ($uid === false) {
        out(401, ['error' => 'unknown_user']);
        return;
    }
    $sid = bin2hex(random_bytes(16));
    $db->prepare('INSERT INTO sessions (sid, user_id) VALUES (?, ?)')->execute([$sid, (int)$uid]);
    setcookie('PHPSESSID', $sid, ['path' => '/', 'httponly' => true]);
    out(200, ['user' => $_POST['user']]);
    return;
}

if ($path === '/withdraw' && $method === 'POST') {
    $uid = user($db);
    if ($uid === 0) {
        out(401, ['error' => 'login_required']);
        return;
    }
    $amount = (int)($_POST['amount'] ?? 0);
    if ($amount <= 0) {
        out(400, ['error' => 'invalid_amount']);
        return;
    }
    $token = $_SERVER['HTTP_IDEMPOTENCY_KEY'] ?? ($_POST['withdraw_token'] ?? '');
    $db->prepare('INSERT INTO seen (user_id, token) VALUES (?, ?)')->execute([$uid, $token]);
    $q = $db->prepare('SELECT balance FROM users WHERE id = ?');
    $q->execute([$uid]);
    $balance = (int)$q->fetchColumn();
    $q->closeCursor();
    if ($balance < $amount) {
        out(422, ['error' => 'insufficient_funds', 'balance' => $balance]);
        return;
    }
    usleep((int)($_SERVER['HTTP_X_TEST_DELAY_MS'] ?? 100) * 1000); // the payout provider's API call
    $db->prepare('UPDATE users SET balance = ? WHERE id = ?')->execute([$balance - $amount, $uid]);
    $db->prepare('INSERT INTO withdrawals (user_id, amount, token) VALUES (?, ?, ?)')->execute([$uid, $amount, $token]);
    out(201, ['id' => (int)$db->lastInsertId(), 'amount' => $amount, 'balance' => $balance - $amount]);
    return;
}

if ($path === '/state' && $method === 'GET') {
    $uid = user($db);
    $q = $db->prepare('SELECT balance FROM users WHERE id = ?');
    $q->execute([$uid]);
    $balance = (int)$q->fetchColumn();
    $w = [];
    $q = $db->prepare('SELECT token, COUNT(*) FROM withdrawals WHERE user_id = ? GROUP BY token');
    $q->execute([$uid]);
    foreach ($q->fetchAll(PDO::FETCH_NUM) as [$t, $n]) {
        $w[(string)$t] = (int)$n;
    }
    $s = [];
    $q = $db->prepare('SELECT token, COUNT(*) FROM seen WHERE user_id = ? GROUP BY token');
    $q->execute([$uid]);
    foreach ($q->fetchAll(PDO::FETCH_NUM) as [$t, $n]) {
        $s[(string)$t] = (int)$n;
    }
    $q = $db->prepare('SELECT COUNT(*), COALESCE(SUM(amount), 0) FROM withdrawals WHERE user_id = ?');
    $q->execute([$uid]);
    [$n, $sum] = $q->fetch(PDO::FETCH_NUM);
    out(200, ['balance' => $balance, 'withdrawals' => (int)$n, 'withdrawn' => (int)$sum, 'by_token' => (object)$w, 'seen' => (object)$s]);
    return;
}

out(404, ['error' => 'not_found']);
