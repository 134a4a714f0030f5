// The official OpenAI JavaScript client against a running pagellm: chat, streaming chat,
// text completions, tool calls, and an error surfaced as the client's own error type.
// Usage: node client_test.mjs BASE_URL MODEL   (exits non-zero on the first failure)
import assert from 'node:assert/strict';
import OpenAI from 'openai';

const [baseURL, model] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: 'test-key', maxRetries: 0 });
let passed = 0;
async function check(name, fn) {
  await fn();
  passed += 1;
  console.log(`ok - ${name}`);
}

await check('chat completion', async () => {
  const r = await client.chat.completions.create({
    model, messages: [{ role: 'user', content: 'Hello there' }], max_tokens: 8, temperature: 0,
  });
  assert.equal(r.object, 'chat.completion');
  assert.equal(r.choices[0].message.role, 'assistant');
  assert.equal(typeof r.choices[0].message.content, 'string');
  assert.equal(r.choices[0].finish_reason, 'length');
  assert.equal(r.usage.completion_tokens, 8);
});

await check('streaming chat gives the same greedy text', async () => {
  const whole = await client.chat.completions.create({
    model, messages: [{ role: 'user', content: 'Tell me more' }], max_tokens: 10, temperature: 0,
  });
  const stream = await client.chat.completions.create({
    model, messages: [{ role: 'user', content: 'Tell me more' }], max_tokens: 10, temperature: 0,
    stream: true, stream_options: { include_usage: true },
  });
  let text = '';
  let finish = null;
  let usage = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    for (const choice of chunk.choices) {
      text += choice.delta.content ?? '';
      if (choice.finish_reason) finish = choice.finish_reason;
    }
  }
  assert.equal(text, whole.choices[0].message.content);
  assert.equal(finish, 'length');
  assert.equal(usage.completion_tokens, 10);
});

await check('text completion', async () => {
  const r = await client.completions.create({ model, prompt: 'Once upon a time', max_tokens: 5 });
  assert.equal(r.object, 'text_completion');
  assert.equal(typeof r.choices[0].text, 'string');
  assert.equal(r.usage.completion_tokens, 5);
});

// The served model's token 511 is a whole <tool_call> (run.sh); logit_bias makes it write it.
const weather = {
  model, messages: [{ role: 'user', content: 'Weather in Paris?' }], temperature: 0,
  logit_bias: { 511: 100 }, max_tokens: 2,
  tools: [{ type: 'function', function: { name: 'get_weather', parameters: {
    type: 'object', properties: { city: { type: 'string' } } } } }],
};

await check('tool calls, whole and through the client\'s stream helper', async () => {
  const r = await client.chat.completions.create(weather);
  const message = r.choices[0].message;
  assert.equal(message.content, null);
  assert.equal(message.tool_calls.length, 2);
  for (const call of message.tool_calls) {
    assert.equal(call.type, 'function');
    assert.equal(call.function.name, 'get_weather');
    assert.deepEqual(JSON.parse(call.function.arguments), { city: 'Paris' });
  }
  const stream = client.chat.completions.stream({ ...weather, stop: ['</tool_call>'], max_tokens: 4 });
  const final = await stream.finalChatCompletion();
  assert.equal(final.choices[0].finish_reason, 'tool_calls');
  const calls = final.choices[0].message.tool_calls;
  assert.equal(calls.length, 1);
  assert.match(calls[0].id, /^call_/);
  assert.deepEqual(JSON.parse(calls[0].function.arguments), { city: 'Paris' });
});

await check('errors arrive as the client\'s own error types', async () => {
  await assert.rejects(
    client.chat.completions.create({ model, messages: [], max_tokens: 4 }),
    (e) => e instanceof OpenAI.BadRequestError && e.status === 400 && /messages/.test(e.message));
  await assert.rejects(
    client.chat.completions.create({ model: 'no-such-model', messages: [{ role: 'user', content: 'x' }] }),
    (e) => e instanceof OpenAI.NotFoundError && e.status === 404);
});

console.log(`${passed} passed, 0 failed`);
